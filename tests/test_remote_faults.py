"""Frequent transient remote faults (issue 47, item 11): a file is not lost with the default settings.
One attempt is one request, ``retries`` bounds the attempts of each request that fails, and what a request
got is kept (a body cut short is resumed from the byte it reached). Against moto's S3 behind the fault
proxy of ``test_storage``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_storage import ids, jsonl, loader_over, moto_port, put_files, s3  # noqa: F401  # the fixtures

import pyloader as pl
from pyloader._storage.remote import is_transient

# workers are forked (they must see the proxy set up in this process) beside moto's and the proxy's threads
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:pyloader. worker processes are forked while other threads")]

EVERY_KIND = ("reset", "cut", "body", "503", "500")


def _object_get(request: str) -> bool:
    return request.startswith("GET ") and "list-type" not in request


_DEFAULTS = textwrap.dedent("""
    import json, sys
    import pyloader as pl
    from pyloader.collators import NumpyCollator
    from pyloader.readers import JsonLinesReader
    with pl.DataLoader(JsonLinesReader(4), pl.IdentityDataset(), NumpyCollator(), sys.argv[1], num_epoch=2) as loader:
        print(json.dumps(sorted(int(i) for batch in loader for i in batch["id"])))
""")


def test_a_quarter_of_all_requests_failing_loses_no_file_under_the_default_settings(s3):  # noqa: F811
    """A fresh interpreter, the user's own S3 settings, pyloader's defaults: every request fails its first
    four times (the attempts the defaults made before), then a quarter of them fail, by every kind of
    fault, listing, HEAD and GET alike."""
    put_files(s3, "quarter", 3, rows=10)
    s3.proxy.kinds, s3.proxy.fail_first, s3.proxy.share = EVERY_KIND, 4, 0.25
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3.proxy.port}"}
    run = subprocess.run([sys.executable, "-c", _DEFAULTS, "s3://store/quarter"], env=env, capture_output=True,
                         text=True, timeout=100)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.splitlines()[-1]) == sorted(list(range(30)) * 2)
    assert s3.proxy.faults >= 4 * 8  # 2 listing requests, and a HEAD and a GET per file, each failed 4 times


@pytest.mark.parametrize("num_workers,readahead_bytes", [(0, 2**20), (0, 300), (2, 2**20)],
                         ids=["whole", "blocks", "workers"])
def test_a_body_cut_short_is_resumed_from_the_byte_it_reached(s3, num_workers, readahead_bytes):  # noqa: F811
    prefix = f"cut-{num_workers}-{readahead_bytes}"
    put_files(s3, prefix, 1, rows=20)  # about 1.2 KB
    s3.proxy.faulty, s3.proxy.kinds, s3.proxy.share = _object_get, ("body",), 1.0  # every body closed halfway
    storage = pl.Storage(retries=1, readahead_bytes=readahead_bytes)
    with loader_over(f"s3://store/{prefix}", storage=storage, num_workers=num_workers) as loader:
        assert ids(loader) == list(range(20))
    assert s3.proxy.gets("part-0") > 5  # each request got half of what was left, and the next asked for the rest


def test_one_attempt_is_one_request_and_retries_bound_the_attempts_of_each(s3):  # noqa: F811
    prefix = "once"
    put_files(s3, prefix, 1)
    s3.proxy.faulty, s3.proxy.kinds, s3.proxy.share = _object_get, ("503",), 1.0  # HEAD answers, GET never
    loader = loader_over(f"s3://store/{prefix}", storage=pl.Storage(retries=2), num_workers=0)
    with pytest.raises(pl.PipelineError, match=f"s3://store/{prefix}/part-0.jsonl") as info:
        for _ in loader:  # not list(loader): its len() would count the file, opening it apart
            pass
    loader.close()
    with s3.proxy._lock:
        requests = [r.split()[0] for r in s3.proxy.requests if f"/{prefix}/part-0.jsonl" in r]
    assert requests == ["HEAD", "GET", "GET", "GET"]  # the size once, then the GET alone, in 3 attempts
    assert is_transient(info.value.__cause__)
    assert any("after 3 attempts" in note for note in getattr(info.value.__cause__, "__notes__", []))


def test_each_request_of_a_listing_is_retried_by_itself(s3):  # noqa: F811
    put_files(s3, "listing", 3)
    s3.proxy.faulty = lambda request: "list-type" in request
    s3.proxy.kinds, s3.proxy.fail_first = ("503", "reset"), 2  # each listing request fails twice, then answers
    loader = loader_over("s3://store/listing", storage=pl.Storage(retries=2))
    assert [f.rsplit("/", 1)[1] for f in loader.files] == ["part-0.jsonl", "part-1.jsonl", "part-2.jsonl"]
    assert s3.proxy.faults >= 4  # two requests at least (is it a folder; its files), each failed twice


def test_a_body_cut_short_is_not_resumed_from_an_object_changed_meanwhile(s3):  # noqa: F811
    key = "changing/part-0.jsonl"
    s3.put_object(Bucket="store", Key=key, Body=jsonl(10, 20))
    gets = []

    def faulty(request: str) -> bool:  # the first GET's body is cut; the object changes before the second
        if _object_get(request):
            gets.append(request)
            if len(gets) == 2:  # the same layout: its second half would join the first as valid lines
                s3.put_object(Bucket="store", Key=key, Body=jsonl(30, 20))
        return len(gets) == 1

    s3.proxy.faulty, s3.proxy.kinds, s3.proxy.share = faulty, ("body",), 1.0
    loader = loader_over("s3://store/changing", num_workers=0)
    with pytest.raises(pl.PipelineError, match=f"s3://store/{key}") as info:
        for _ in loader:
            pass
    loader.close()
    assert isinstance(info.value.__cause__, OSError) and not is_transient(info.value.__cause__)
    assert len(gets) == 2  # refused at once: not retried
