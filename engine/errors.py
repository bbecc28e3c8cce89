"""Errors the engine raises. All derive from EngineError, so a CLI catches one type."""


class EngineError(Exception):
    """Base class of every error the engine raises on bad input or misuse."""


class ShapeError(EngineError, ValueError):
    """An op was built on inputs whose shapes it cannot take."""


class ParamError(EngineError, ValueError):
    """An op was given a malformed parameter: of the wrong type (a float kernel size, a
    string eps), with the wrong number of entries (an offset or pads without one entry per
    axis), outside its range (a negative stride, dropout p = 1), an unknown mode, or two
    parameters that contradict each other (clamp's min above its max). A well-formed
    parameter that does not fit the input's shape (an axis beyond its rank, a block or a
    window larger than it) is a ShapeError."""


class DTypeError(EngineError, TypeError):
    """An op was built on inputs whose dtypes it cannot take."""


class UnknownOpError(EngineError, KeyError):
    """An op name that the registry does not hold."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class RowIndexError(EngineError, IndexError):
    """get_rows or get_rows_back met an index outside the table's rows (at run time: indices
    are data, so no shape rule can see them)."""


class StalePlanError(EngineError, RuntimeError):
    """An allocation plan was asked to run a graph other than the one it was made for."""


class BackendError(EngineError, RuntimeError):
    """A backend lacks a kernel, or was asked for something it cannot do."""


class HyperparameterError(EngineError, ValueError):
    """An optimizer or schedule was given a hyperparameter outside its valid range."""
