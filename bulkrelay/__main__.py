from bulkrelay.cli import main

main()
