from tests.chaos.campaign import main

main()
