from __future__ import annotations

from overlay.cli.main import main

raise SystemExit(main())
