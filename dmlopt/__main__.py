"""`python -m dmlopt` is the `dmlopt` command."""

import sys

from dmlopt.launch import main

sys.exit(main())
