import time, json
import test_storage as T
from test_storage import s3, moto_port  # fixtures
from pyloader._remote import filesystem, version

def test_dbg(s3, tmp_path):
    T.put_files(s3, "dbg", 2)
    l = T.loader_over("s3://store/dbg", num_epoch=1)
    fs, p = filesystem("s3://store/dbg/part-0.jsonl")
    print(fs.info(p))
    fs.invalidate_cache()
    print(fs.info(p))
