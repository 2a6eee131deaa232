"""Errors raised by fourd.

Every class derives from :class:`fourd.Error` (a ``RuntimeError``). Bad arguments raise
subclasses of ``ValueError`` or ``TypeError`` as well, and deadlines a subclass of the builtin
``TimeoutError``, so ``except ValueError`` and ``except TimeoutError`` work as usual.
docs/errors.md lists each error, what it means and what to do.
"""

import builtins


class Error(RuntimeError):
    """Base class of every fourd error."""


class InvalidArgumentError(Error, ValueError):
    """A bad argument, detected before any communication. The message names the argument,
    what was expected and what was found."""


class DTypeError(Error, TypeError):
    """A dtype or object type that does not fit the call."""


class BackendError(Error):
    """The MPI or NCCL library reported an error (the message carries its code and text)."""


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 - deliberately shadows the builtin
    """A wait passed its deadline. The message names the operation, axis, group ranks, sequence
    number, elapsed time and, where known, the peers that never arrived. The communicator is
    poisoned: later calls on it raise AbortedError at once."""


class AbortedError(Error):
    """The communicator was poisoned by an earlier timeout, interrupt or backend failure."""


class MismatchError(Error):
    """The ranks of a group disagree: different grid arguments at init, or (FOURD_DEBUG=1)
    different collectives, counts or dtypes."""


class NotInitializedError(Error):
    """A collective was called before ``fourd.init()`` or after ``fourd.finalize()``."""


_NATIVE_CLASSES = {
    "Error": Error,
    "InvalidArgument": InvalidArgumentError,
    "TypeMismatch": DTypeError,
    "BackendError": BackendError,
    "TimeoutError": TimeoutError,
    "AbortedError": AbortedError,
    "MismatchError": MismatchError,
}
