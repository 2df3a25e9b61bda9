from pipeline.cli import exit_now, main

exit_now(main())
