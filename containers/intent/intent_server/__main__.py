"""``python -m intent_server [serve]``: the same as the ``serve`` executable."""

from intent_server.main import main

main()
