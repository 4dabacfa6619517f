"""``python -m pyloader``: the command line (see ``pyloader._cli``)."""
from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
