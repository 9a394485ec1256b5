"""``python -m specbuild.cli``: the ``specbuild`` command."""

from specbuild.cli import main

main()
