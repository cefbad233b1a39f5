import sys

from sorl_verl.stability.cli import main

sys.exit(main())
