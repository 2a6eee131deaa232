"""The --json and --csv files of a run, kept valid while it runs (rank 0 only; nothing here
communicates).

Both are rewritten after every measured row: written to a temporary file beside the target,
then renamed over it (`os.replace`, atomic on POSIX), so a reader, or a run killed at any
moment, finds either the previous complete file or the new one, never half of one. The JSON's
`progress.state` says "running" until the end, then "complete" or "interrupted".

A rewrite costs little even late in a long sweep: each row's JSON and CSV text is made once and
kept (rows do not change once recorded, except their ratio to a baseline measured later, the
torch pass, which makes the text again), so a rewrite joins kept strings and computes the
summary (report.summarize, linear in the rows): 66 ms for 1,000 rows (10 MB of JSON, every
iteration's time in it) on the 2-core VM. So that the files never take more than SHARE of a
run, a rewrite comes at least its own cost / SHARE after the previous one (the first ones
after every row, those of a long sweep's last rows about one a second); the rows in between
are written with the next one, and the last rewrite (the end of the run, or a stop) holds
them all. A run killed outright (SIGKILL) loses at most the rows of that interval.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time

from . import report

# What the document's "rows" holds while the rest is serialized; replaced by the kept rows.
_ROWS_MARK = "@@fourd.bench: rows@@"
SHARE = 0.05  # the most of a run's time that rewriting the files may take


def replace_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file in the same folder and a rename (the
    temporary file is made as open() makes files, with the process' umask)."""
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _mutable(row: dict) -> tuple:
    """The fields a recorded row may still change (a later baseline's ratio)."""
    return (row.get("ratio_vs_mpi"), row.get("ratio_vs_torch"), row.get("ratio_vs_fourd"))


class _Kept:
    """Each row's text in one format, made once per version of its mutable fields."""

    def __init__(self, render):
        self._render = render
        self._texts: dict = {}  # id(row) -> (mutable fields, text)

    def text(self, row: dict) -> str:
        key, now = id(row), _mutable(row)
        kept = self._texts.get(key)
        if kept is None or kept[0] != now:
            kept = (now, self._render(row))
            self._texts[key] = kept
        return kept[1]


def _json_row(row: dict) -> str:
    """A row as json.dump(doc, indent=1) lays it out inside the document's "rows" list."""
    text = json.dumps(report.json_clean(row), indent=1, allow_nan=False)
    return "\n".join("  " + line for line in text.split("\n"))


_CSV_NAMES = [k for k, _ in report.ROW_FIELDS]


def _csv_row(row: dict) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerow(report.csv_values(row, _CSV_NAMES))
    return buf.getvalue()


def json_text(doc: dict, kept: _Kept | None = None) -> str:
    """The document as report.write_json writes it (json.dump, indent=1), its rows from
    `kept` (made once per row)."""
    kept = kept or _Kept(_json_row)
    rows = doc["rows"]
    text = json.dumps(report.json_clean({**doc, "rows": _ROWS_MARK}), indent=1, allow_nan=False)
    body = "[]" if not rows else "[\n" + ",\n".join(kept.text(r) for r in rows) + "\n ]"
    mark = f'"rows": {json.dumps(_ROWS_MARK)}'
    return text.replace(mark, f'"rows": {body}', 1) + "\n"


class Outputs:
    """--json and --csv, rewritten after each row (update) and at the end (update with the
    final state). `document` makes the JSON document of the rows so far (header.document)."""

    def __init__(self, json_path: str | None, csv_path: str | None, document, share=SHARE):
        self.json_path, self.csv_path = json_path, csv_path
        self._document = document
        self._json = _Kept(_json_row)
        self._csv = _Kept(_csv_row)
        self._share = share  # 0: rewrite after every row
        self._next_at = 0.0  # time.monotonic() before which a "running" rewrite waits
        self.writes = 0
        self.error: str | None = None  # the first failure to write (the driver's)

    @property
    def wanted(self) -> bool:
        return bool(self.json_path or self.csv_path)

    def update(self, rows: list, state: str = "running", doc: dict | None = None) -> bool:
        """Both files from `rows` (every row recorded so far); `state` goes into the JSON's
        progress section (`doc`: the document, when the caller has made it). A "running"
        update within SHARE of the last one's cost is left for the next (False); any other
        state is written at once. Raises OSError when a file cannot be written."""
        t0 = time.monotonic()
        if state == "running" and t0 < self._next_at:
            return False
        if self.json_path:
            doc = doc if doc is not None else self._document(state)
            replace_atomically(self.json_path, json_text(doc, self._json))
        if self.csv_path:
            header = _csv_line(_CSV_NAMES)
            replace_atomically(self.csv_path, header + "".join(self._csv.text(r) for r in rows))
        self.writes += 1
        now = time.monotonic()
        self._next_at = now + (now - t0) / self._share if self._share > 0 else 0.0
        return True


def _csv_line(values: list) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerow(values)
    return buf.getvalue()
