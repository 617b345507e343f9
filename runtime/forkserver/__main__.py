"""``python -m runtime.forkserver FD MODULE,... ROOM``: run a zygote."""

import sys

from ._zygote import _main

sys.exit(_main(sys.argv[1:]))
