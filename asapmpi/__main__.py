"""python -m asapmpi: the asapmpi command line."""
import sys

from .cli import main

sys.exit(main())
