"""``python -m ascendc_pack.bench``: see :mod:`ascendc_pack.bench.command`."""

from ascendc_pack.bench.command import main

main()
