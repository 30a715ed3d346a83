from bulkrelay.cli.main import main

main()
