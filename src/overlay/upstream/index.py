"""The package index as pip is configured to see it (``pip config list``: index-url, extra-index-url, find-links,
no-index, the ``PIP_*`` variables): every file of a release with its sha256, from the simple API (PEP 691 JSON, or
PEP 503 HTML with ``#sha256=`` fragments)."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from overlay.core.manifest import artifact_name_parts
from overlay.errors import ConfigError, ExternalCommandError, IntegrityError

SHA256 = re.compile(r"^[0-9a-f]{64}$")


_JSON_TYPE = "application/vnd.pypi.simple.v1+json"


SDIST_SUFFIXES = (".tar.gz", ".zip")


@dataclass(frozen=True)
class PipSources:
    """Where pip looks for distributions (``pip config list``, environment included)."""

    index_url: str = "https://pypi.org/simple"
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False

    @property
    def pages(self) -> tuple[str, ...]:
        return () if self.no_index else (self.index_url, *self.extra_index_urls)


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    yanked: bool = False


def pip_sources(config_list: str) -> PipSources:
    """Parse ``pip config list`` output; ``:env:`` (PIP_* variables) wins over ``[download]``, which wins over
    ``[global]``, as when pip downloads."""
    values: dict[str, dict[str, str]] = {}
    for line in config_list.splitlines():
        key, sep, raw = line.partition("=")
        section, dot, name = key.rpartition(".")
        if not sep or not dot:
            continue
        values.setdefault(name, {})[section] = raw.strip().strip("'\"")

    def get(name: str) -> str | None:
        by_section = values.get(name, {})
        return next((by_section[s] for s in (":env:", "download", "global") if s in by_section), None)

    no_index = (get("no-index") or "").lower() in ("1", "true", "yes", "on")
    return PipSources(
        index_url=get("index-url") or PipSources.index_url,
        extra_index_urls=tuple((get("extra-index-url") or "").split()),
        find_links=tuple((get("find-links") or "").split()),
        no_index=no_index,
    )


def configured_sources() -> PipSources:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise ExternalCommandError(
            f"`pip config list` failed: {proc.stderr.strip()[-500:]}",
            tip="check that pip runs in this environment (python -m pip --version)",
        )
    return pip_sources(proc.stdout)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            a = dict(attrs)
            if a.get("href"):
                self.links.append((a["href"] or "", "data-yanked" in a))


def parse_project_page(body: bytes, *, content_type: str, base_url: str) -> list[IndexFile]:
    """The files a simple-API project page lists (PEP 691 JSON or PEP 503 HTML)."""
    if content_type.split(";")[0].strip() == _JSON_TYPE:
        try:
            data = json.loads(body)
            entries = [
                (
                    f["filename"],
                    urllib.parse.urljoin(base_url, f["url"]),
                    f.get("hashes", {}).get("sha256"),
                    bool(f.get("yanked")),
                )
                for f in data["files"]
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ExternalCommandError(
                f"{base_url}: not a PEP 691 project page ({type(exc).__name__}: {exc})"
            ) from None
        return [
            IndexFile(n, u, h if isinstance(h, str) and SHA256.match(h) else None, y)
            for n, u, h, y in entries
        ]
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    out = []
    for href, yanked in parser.links:
        url = urllib.parse.urljoin(base_url, href)
        parsed = urllib.parse.urlsplit(url)
        m = re.fullmatch(r"sha256=([0-9a-f]{64})", parsed.fragment)
        name = urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
        out.append(IndexFile(name, parsed._replace(fragment="").geturl(), m.group(1) if m else None, yanked))
    return out


def _read_url(url: str, *, accept: str) -> tuple[bytes, str] | None:
    """(body, content type), or None when the page does not exist (404, a missing file)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
        if path.is_dir():
            path = path / "index.html"
        return (path.read_bytes(), "text/html") if path.is_file() else None
    if parsed.scheme not in ("http", "https"):
        raise ConfigError(
            f"pip's index {url!r} has the scheme {parsed.scheme!r}; only file://, http:// and https://",
            tip="check `pip config list`",
        )
    req = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.read(), resp.headers.get("Content-Type", "text/html")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise ExternalCommandError(
            f"the package index answered {exc.code} for {url}",
            tip="check network access to the index (pip config list)",
        ) from None
    except http.client.HTTPException as exc:  # the server answered, but not in HTTP (a wrong port, a proxy)
        raise ExternalCommandError(
            f"cannot read {url}: the answer is not HTTP ({type(exc).__name__})",
            tip="check the index URL (pip config list)",
        ) from None
    except (OSError, ValueError) as exc:
        raise ExternalCommandError(
            f"cannot read {url}: {exc}", tip="check network access to the index (pip config list)"
        ) from None


def index_files(sources: PipSources, distribution: str) -> list[IndexFile]:
    """Every file the configured indexes and find-links locations list for ``distribution`` (any version)."""
    name = canonicalize_name(distribution)
    found: list[IndexFile] = []
    for index in sources.pages:
        page = index.rstrip("/") + f"/{name}/"
        got = _read_url(page, accept=f"{_JSON_TYPE}, text/html;q=0.1")
        if got is not None:
            found += parse_project_page(got[0], content_type=got[1], base_url=page)
    for link in sources.find_links:
        local = (
            Path(urllib.request.url2pathname(urllib.parse.urlsplit(link).path))
            if link.startswith("file:")
            else (Path(link) if "://" not in link else None)
        )
        if local is not None and local.is_dir():
            found += [
                IndexFile(p.name, p.resolve().as_uri(), None) for p in sorted(local.iterdir()) if p.is_file()
            ]
        elif local is None:
            got = _read_url(link, accept="text/html")
            if got is not None:
                found += parse_project_page(got[0], content_type=got[1], base_url=link)
    return found


def release_files(files: list[IndexFile], distribution: str, version: str) -> list[IndexFile]:
    """The wheels and sdists of exactly ``distribution`` ``version``, one per file name; the same name with two
    different hashes on two indexes is an IntegrityError."""
    by_name: dict[str, IndexFile] = {}
    for f in files:
        if not f.filename.endswith((".whl", *SDIST_SUFFIXES)):
            continue
        try:
            dist, ver = artifact_name_parts(f.filename)
        except ValueError:
            continue
        if canonicalize_name(dist) != canonicalize_name(distribution) or ver != Version(version):
            continue
        seen = by_name.get(f.filename)
        if seen is None or (seen.sha256 is None and f.sha256 is not None):
            by_name[f.filename] = f
        elif f.sha256 is not None and seen.sha256 != f.sha256:
            raise IntegrityError(
                f"two indexes serve {f.filename} with different contents: sha256 {seen.sha256} ({seen.url}) and "
                f"{f.sha256} ({f.url})",
                tip="check the indexes pip is configured with (`pip config list`); pin from the one you trust",
            )
    return list(by_name.values())


def order_artifacts(names: list[str]) -> list[str]:
    """Wheels first, the primary one (what `apply` builds from) at the head: the wheel this interpreter would
    install, else a pure-Python one, else the first by name; then the other wheels and the sdists, by name."""
    wheels = sorted(n for n in names if n.endswith(".whl"))
    sdists = sorted(n for n in names if not n.endswith(".whl"))
    rank = {str(t): i for i, t in enumerate(sys_tags())}

    def key(n: str) -> tuple[int, int, str]:
        tags = parse_wheel_filename(n)[3]
        best = min((rank[str(t)] for t in tags if str(t) in rank), default=len(rank))
        pure = 0 if any(t.abi == "none" and t.platform == "any" for t in tags) else 1
        return (best, pure, n)

    primary = min(wheels, key=key) if wheels else None
    return ([primary] if primary else []) + [n for n in wheels if n != primary] + sdists


def hash_url(url: str) -> str:
    digest = hashlib.sha256()
    parsed = urllib.parse.urlsplit(url)
    try:
        if parsed.scheme == "file":
            with Path(urllib.request.url2pathname(parsed.path)).open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
        else:
            with urllib.request.urlopen(url, timeout=300) as resp:
                for chunk in iter(lambda: resp.read(1 << 20), b""):
                    digest.update(chunk)
    except OSError as exc:
        raise ExternalCommandError(
            f"cannot read {url} to hash it (the index gives no sha256): {exc}"
        ) from None
    return digest.hexdigest()
