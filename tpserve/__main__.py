"""python -m tpserve: the same as the `tpserve` command."""

from tpserve.cli import main

main()
