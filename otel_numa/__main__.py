from otel_numa.cli import main

raise SystemExit(main())
