"""`python -m strata_cli serve ...`"""
import sys

from strata_cli import main

sys.exit(main())
