from lorapod.cli.main import main

main()
