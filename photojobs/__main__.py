from photojobs.cli import main

main()
