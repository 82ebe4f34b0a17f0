"""The base of every stage's options model (one pydantic model per stage).

Each stage (ingest, segment, label, aggregate, verify, review study, export, view, capture,
steer, ...) declares its options once, as a subclass of :class:`StageOptions`: unknown names are
refused with the closest known name, every value is checked against its bounds when the model is
built (so validation happens once), the model is frozen, and a run records
``options.model_dump(mode="json")``. The CLI derives its flags' defaults from the fields.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ConfigError

OptionsT = TypeVar("OptionsT", bound="StageOptions")

#: Largest seed of a random generator: NumPy's legacy ``RandomState``, scikit-learn's and crowd-kit's
#: ``random_state`` take ``0 .. 2**32 - 1`` (``numpy.random.RandomState`` documentation); a negative
#: seed is refused by every one of them, ``numpy.random.default_rng`` included.
SEED_MAX = 2**32 - 1
#: Most bootstrap / label resamples one figure may ask for (each resample is a row of counts or
#: labels held in memory: 100,000 x 10,000 traces is already 8 GB of counts).
RESAMPLES_MAX = 100_000
#: Most characters of context one option may ask for (stored in 32-bit integer columns).
CHARS_MAX = 10_000_000

#: A seed option: a whole number in ``0 .. SEED_MAX``.
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
#: A resamples option: a whole number in ``0 .. RESAMPLES_MAX`` (0: no resampling).
Resamples = Annotated[int, Field(ge=0, le=RESAMPLES_MAX)]


class StageOptions(BaseModel):
    """Validated, frozen options of one stage; subclasses add fields (``extra="forbid"``)."""

    # allow_inf_nan=False: a float option is a finite number (`--temperature 1e400` was inf, accepted by
    # its bound >= 0, and ended the run in "Out of range float values are not JSON compliant";
    # `--batch-poll 1e400` waited forever)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    #: Name used in error messages ("the aggregate stage"); subclasses set it, as a ``ClassVar``
    #: (a class attribute, not an option: it is neither accepted nor dumped).
    stage: ClassVar[str] = "stage"

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a subclass that declares ``stage`` as a field (``stage: str = ...``).

        Raises
        ------
        TypeError
            ``stage`` is a field of the subclass: it would become an option and shadow the stage name.
        """
        super().__pydantic_init_subclass__(**kwargs)
        if "stage" in cls.model_fields:
            raise TypeError(f"{cls.__name__}.stage must be a class variable: declare it as `stage: ClassVar[str] = ...`")

    @classmethod
    def from_options(
        cls: type[OptionsT], options: dict[str, Any], *, what: str | None = None, keep_none: bool = False,
    ) -> OptionsT:
        """Validate keyword options; ``None`` values mean "not given" and take the default.

        With ``keep_none`` a ``None`` is a value like any other (a library function's keyword
        arguments, where ``max_failed=None`` means "no limit", not "the default limit").

        Raises
        ------
        ConfigError
            An unknown option (with the closest known name) or a value out of bounds, named as its
            command-line flag (``--chunk-size must be >= 1, got 0``).
        """
        what = what or cls.stage
        known = list(cls.model_fields)
        unknown = [name for name in options if name not in cls.model_fields]
        if unknown:
            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, known, n=1)
                hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ConfigError(f"unknown option(s) for {what}: {', '.join(hints)}; known options: {', '.join(known)}")
        given = dict(options) if keep_none else {k: v for k, v in options.items() if v is not None}
        try:
            return cls(**given)
        except ValidationError as exc:
            raise options_error(exc, given) from exc

    @classmethod
    def resolve(cls: type[OptionsT], options: OptionsT | None, keywords: dict[str, Any]) -> OptionsT:
        """The options of a library call that takes ``options=None, **keywords``: the model as given,
        or the keywords validated into one (``None`` kept as a value, see :meth:`from_options`).

        Raises
        ------
        ConfigError
            Both a model and keywords given, an unknown keyword (with the closest known name), or a
            bad value (named as its flag).
        """
        if options is None:
            return cls.from_options(keywords, keep_none=True)
        if keywords:
            what = cls.stage
            raise ConfigError(f"give the options of {what} either as options= or as keywords, not both: {', '.join(keywords)}")
        return options

    def recorded(self) -> dict[str, Any]:
        """The options as a run records them (JSON types; ``stage`` is a class variable, not among them)."""
        return self.model_dump(mode="json")


def options_error(exc: ValidationError, given: dict[str, Any]) -> ConfigError:
    """A :class:`ConfigError` naming the first invalid option as its command-line flag."""
    err = exc.errors()[0]
    name = str(err["loc"][0]) if err["loc"] else "options"
    flag = f"--{name.replace('_', '-')}"
    return ConfigError(f"{flag} {_expected(err)}, got {given.get(name)!r}")


def _expected(err: Any) -> str:
    ctx = err.get("ctx") or {}
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if err["type"] in bounds:
        limit = next(iter(ctx.values()), "?")
        return f"must be {bounds[err['type']]} {limit}"
    if err["type"] == "literal_error":
        return f"must be {ctx.get('expected', 'one of the allowed values')}"
    return f"is invalid: {err['msg'][0].lower()}{err['msg'][1:]}"


__all__ = ["CHARS_MAX", "RESAMPLES_MAX", "SEED_MAX", "Resamples", "Seed", "StageOptions", "options_error"]
