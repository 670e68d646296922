"""`python -m sweeper.report <sweep run id | experiment>`: rebuild a sweep's report from MLflow alone."""

import sys

from sweeper.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
