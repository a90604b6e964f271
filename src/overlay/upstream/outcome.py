"""What a replay says about one patch of the old series (:class:`Outcome`): its class, how it was resolved, where its
hunks went; the rebase state and reports store it as JSON (:class:`overlay.schemas.documents.OutcomeDoc`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from overlay.schemas.documents import OutcomeDoc
from overlay.upstream.astmap import HunkMove
from overlay.upstream.relocate import HunkPlacement

PatchClass = Literal["clean", "offset", "merged", "conflict", "upstreamed", "obsolete"]
CLASSES: tuple[PatchClass, ...] = ("clean", "offset", "merged", "conflict", "upstreamed", "obsolete")
Resolution = Literal["auto", "pending", "user", "dropped", "skipped"]


@dataclass(frozen=True)
class Outcome:
    """What happened to one patch of the old series."""

    name: str  # the patch file name in the old series
    subject: str
    cls: PatchClass
    detail: str
    old_commit: str
    resolution: Resolution = "auto"
    commit: str | None = None  # the rebased commit; None when dropped or not resolved yet
    offsets: tuple[HunkPlacement, ...] = ()
    renames: tuple[tuple[str, str, int], ...] = ()  # (old path, new path, similarity %)
    gone: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    moved: tuple[HunkMove, ...] = ()
    kept_bytes: bool = False  # the rebased commit's diff is byte-identical to the old one: the file is kept
    new_name: str | None = None
    # a dry run's conflict: the patch's own ("own"), or only there because earlier conflicts were left out
    # ("inherited": it does not conflict once those take their own side, as a person's resolution would)
    conflict_kind: Literal["own", "inherited"] | None = None
    inherited_from: tuple[str, ...] = ()

    @property
    def resolved(self) -> bool:
        return self.resolution != "pending"

    @property
    def dropped(self) -> bool:
        return self.resolved and self.commit is None

    def to_json(self) -> OutcomeDoc:
        return {
            "name": self.name,
            "new_name": self.new_name,
            "subject": self.subject,
            "class": self.cls,
            "detail": self.detail,
            "resolution": self.resolution,
            "old_commit": self.old_commit,
            "commit": self.commit,
            "kept_bytes": self.kept_bytes,
            "offsets": [
                {
                    "path": p.path,
                    "hunk": p.index,
                    "from": p.old_start,
                    "to": p.found_start,
                    "offset": p.offset,
                }
                for p in self.offsets
            ],
            "renames": [{"from": a, "to": b, "similarity": s} for a, b, s in self.renames],
            "gone": list(self.gone),
            "conflicts": list(self.conflicts),
            "moved_hunks": [m.to_json() for m in self.moved],
            "conflict_kind": self.conflict_kind,
            "inherited_from": list(self.inherited_from),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Outcome:
        return cls(
            name=d["name"],
            new_name=d.get("new_name"),
            subject=d["subject"],
            cls=d["class"],
            detail=d["detail"],
            resolution=d["resolution"],
            old_commit=d["old_commit"],
            commit=d.get("commit"),
            kept_bytes=bool(d.get("kept_bytes")),
            offsets=tuple(
                HunkPlacement(path=o["path"], index=o["hunk"], old_start=o["from"], found_start=o["to"])
                for o in d.get("offsets", [])
            ),
            renames=tuple((r["from"], r["to"], int(r["similarity"])) for r in d.get("renames", [])),
            gone=tuple(d.get("gone", [])),
            conflicts=tuple(d.get("conflicts", [])),
            moved=tuple(
                HunkMove(path=m["path"], index=m["hunk"], before=tuple(m["before"]), after=tuple(m["after"]))
                for m in d.get("moved_hunks", [])
            ),
            conflict_kind=d.get("conflict_kind"),
            inherited_from=tuple(d.get("inherited_from", [])),
        )
