from otel_numa.cli.main import main

raise SystemExit(main())
