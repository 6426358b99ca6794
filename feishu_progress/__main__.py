from feishu_progress.cli import main

raise SystemExit(main())
