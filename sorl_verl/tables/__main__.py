import sys

from sorl_verl.tables.cli import main

sys.exit(main())
