"""`python -m recordtool.cli`."""
from . import main

main()
