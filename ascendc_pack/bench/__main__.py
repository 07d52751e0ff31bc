"""``python -m ascendc_pack.bench``: see :mod:`ascendc_pack.bench.command`."""

from .command import main

main()
