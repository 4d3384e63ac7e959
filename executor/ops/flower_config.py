"""toolexec's own Flower config file, passed by ``toolexec flower`` as ``--conf``.

Flower runs this file and applies every name in it that is one of its options,
after its ``FLOWER_*`` variables and before its command line. Given explicitly,
it keeps Flower from reading a ``flowerconfig.py`` in the working directory,
which could turn authentication off (``basic_auth = []``). Listen address,
port and basic auth come from ``toolexec flower`` itself, so they are not set
here (a value here would override the basic auth toolexec passes); what is set
here is what decides who gets in, besides basic auth, or what a page shows.
"""

__all__ = ["auth", "auth_provider", "debug", "xheaders"]

#: No OAuth: ``toolexec flower``'s only authentication is basic auth from its settings.
auth = ""
auth_provider = None
#: A 500 page in debug mode shows the traceback, values and all.
debug = False
#: Client addresses and schemes come from the connection, not from headers anyone can send.
xheaders = False
