"""Errors the engine raises. All derive from EngineError, so a CLI catches one type."""


class EngineError(Exception):
    """Base class of every error the engine raises on bad input or misuse."""


class ShapeError(EngineError, ValueError):
    """An op was built on inputs whose shapes it cannot take."""


class DTypeError(EngineError, TypeError):
    """An op was built on inputs whose dtypes it cannot take."""


class UnknownOpError(EngineError, KeyError):
    """An op name that the registry does not hold."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class StalePlanError(EngineError, RuntimeError):
    """An allocation plan was asked to run a graph other than the one it was made for."""


class BackendError(EngineError, RuntimeError):
    """A backend lacks a kernel, or was asked for something it cannot do."""


class HyperparameterError(EngineError, ValueError):
    """An optimizer or schedule was given a hyperparameter outside its valid range."""
