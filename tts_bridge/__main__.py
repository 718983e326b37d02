from tts_bridge.cli import main

raise SystemExit(main())
