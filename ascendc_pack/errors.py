"""Errors raised for things the user must fix.

A candidate kernel that fails to compile or crashes is *not* an exception: it is recorded as a
failed candidate and the build goes on. Exceptions are for the user's inputs: a broken model
file, a bad option, an unsupported graph. Every message names the problem and the fix.
"""

from __future__ import annotations


class PackError(Exception):
    """Base class of every error ascendc-pack raises on purpose."""


class ModelFileError(PackError):
    """The model file cannot be loaded or does not follow the model.py contract (docs/DESIGN.md §2.1)."""


class ConfigError(PackError, ValueError):
    """An option or environment variable has an invalid value."""


class CaptureError(PackError):
    """torch.export could not capture the model, or the graph holds something we cannot run."""


class VerificationError(PackError):
    """A new bundle does not match eager PyTorch (or does not load); nothing was written."""


class CompileError(PackError):
    """A compiler invocation failed (command, output tail and source path are in the message)."""
