from ascendc_pack.cli.main import main

main()
