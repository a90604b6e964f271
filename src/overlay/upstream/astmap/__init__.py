"""Python symbols under a patch's hunks and how they changed upstream (``ast`` only).

- :mod:`.symbols`: the functions and classes of a module with their line spans (decorators included) and dotted
  qualified names (``Engine.step``, ``make_sampler.sampler``).
- :mod:`.locations`: for each hunk of a patch, the symbols its changed lines sit in (module-level code is
  ``<module>``; a file that is not Python, or does not parse, gives none), and the hunk-location check shared by
  ``rebase`` and ``lint`` (:func:`hunk_moves`: a hunk whose enclosing function/class is not the one it sat in at the
  pinned base).
- :mod:`.changes`: what upstream did to one symbol between two trees (unchanged, changed, rewritten, moved, renamed,
  deleted).
"""

from overlay.upstream.astmap.changes import (
    SymbolChange,
    SymbolIndex,
    ast_equal,
    compare_symbol,
    compare_symbol_back,
    file_changes,
)
from overlay.upstream.astmap.locations import (
    HunkLocation,
    HunkMove,
    LineMap,
    added_source,
    check_hunk_locations,
    hunk_locations,
    hunk_moves,
)
from overlay.upstream.astmap.symbols import MODULE, source_of, symbols

__all__ = [
    "MODULE",
    "HunkLocation",
    "HunkMove",
    "LineMap",
    "SymbolChange",
    "SymbolIndex",
    "added_source",
    "ast_equal",
    "check_hunk_locations",
    "compare_symbol",
    "compare_symbol_back",
    "file_changes",
    "hunk_locations",
    "hunk_moves",
    "source_of",
    "symbols",
]
