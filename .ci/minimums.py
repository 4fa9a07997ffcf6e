"""Print a pip constraints file pinning every requirement of the driver and integration extras in
setup.cfg to the lowest version it declares (``redis>=4.5`` becomes ``redis==4.5``), so that CI
can run the tests against the oldest releases the package claims to support. A requirement
without a lower bound fails: every claim is tested."""

from __future__ import annotations

import configparser
import re
import sys
from pathlib import Path

#: The extras whose lower bounds users rely on; test, docs and bench are tool sets, not claims.
EXTRAS = (
    "redis", "postgres", "mongodb", "http", "server", "django", "celery", "flask", "rq", "prometheus", "opentelemetry",
)

#: Packages we do not require ourselves that must still come from the same release line as a
#: pinned minimum, or pip pairs the old release with a new one that refuses it: Celery's kombu
#: (kombu 5.7's Redis transport refuses the redis-py releases Celery 5.3 ran on).
COMPANIONS = {"celery": "kombu"}

#: ``name>=minimum``, then any further specifiers (``,!=8.2.0``: a release excluded above the
#: minimum), then an optional environment marker.
_LOWER_BOUND = re.compile(r"^\s*([A-Za-z0-9_.\[\]-]+?)\s*>=\s*([0-9][^,;\s]*)\s*(?:,[^;]*)?(;.*)?$")


def pins(setup_cfg: Path) -> list[str]:
    """``name==minimum[; marker]`` for each requirement of :data:`EXTRAS`, without repeats."""
    parser = configparser.ConfigParser()
    parser.read(setup_cfg, encoding="utf-8")
    extras = parser["options.extras_require"]
    found: dict[str, str] = {}
    for extra in EXTRAS:
        for line in extras[extra].splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            match = _LOWER_BOUND.match(line)
            if match is None:
                sys.exit(f"setup.cfg extra {extra!r}: {line!r} declares no lower bound to test")
            name, version, marker = match.groups()
            name = re.sub(r"\[.*\]", "", name).lower().replace("_", "-")
            found.setdefault(name, f"{name}=={version}{marker or ''}")
            if name in COMPANIONS:
                major, minor = version.split(".")[:2]
                found.setdefault(COMPANIONS[name], f"{COMPANIONS[name]}~={major}.{minor}.0")
    return list(found.values())


if __name__ == "__main__":
    print("\n".join(pins(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("setup.cfg"))))
