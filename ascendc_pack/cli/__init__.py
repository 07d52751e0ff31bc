"""The ``ascendc-pack`` command line (:mod:`.main`; signing commands in :mod:`.trust`)."""
