"""A patch series: its data (:mod:`.model`), the format-patch parser (:mod:`.parse`) and the series file
(:mod:`.seriesfile`). The names below are the package's interface; import them from here."""

from overlay.core.series.model import (
    NUMERICS,
    REQUIRED_TRAILERS,
    THEMES,
    UPSTREAM_STATUS,
    FileDiff,
    Hunk,
    Line,
    Numerics,
    Patch,
    Series,
    check_trailers,
    series_hash,
)
from overlay.core.series.parse import parse_patch, parse_patch_bytes
from overlay.core.series.seriesfile import (
    SeriesFile,
    load_engine_series,
    load_series,
    parse_series_file,
    render_series,
    slugify,
)

__all__ = [
    "NUMERICS",
    "REQUIRED_TRAILERS",
    "THEMES",
    "UPSTREAM_STATUS",
    "FileDiff",
    "Hunk",
    "Line",
    "Numerics",
    "Patch",
    "Series",
    "SeriesFile",
    "check_trailers",
    "load_engine_series",
    "load_series",
    "parse_patch",
    "parse_patch_bytes",
    "parse_series_file",
    "render_series",
    "series_hash",
    "slugify",
]
