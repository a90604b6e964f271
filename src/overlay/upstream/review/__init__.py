"""`overlay review`: what upstream changed in the code our patches touch (:mod:`.run`), as data (:mod:`.model`), with
the analysis (:mod:`.analysis`), the old series found in history (:mod:`.history`) and the HTML page (:mod:`.html`)."""

from overlay.upstream.review.model import ReviewResult, summary_lines, to_json
from overlay.upstream.review.run import report_path, review

__all__ = ["ReviewResult", "report_path", "review", "summary_lines", "to_json"]
