from tts_bridge.cli.main import main

raise SystemExit(main())
