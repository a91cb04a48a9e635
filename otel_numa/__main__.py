from otel_numa.cli.launch import main

raise SystemExit(main())
