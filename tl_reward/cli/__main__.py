from tl_reward.cli import main

raise SystemExit(main())
