"""msrun, with the command line of `sys.argv`, as on a node that is not the master's though the master's address is
this machine's: two nodes on one machine (tests/test_distributed.py). On one machine msrun takes the master's address
as its own, so a second launch starts a second scheduler, which fails to bind the port; msrun decides it with the
private `mindspore.parallel.cluster.process_entity._api._is_local_ip` (MindSpore 2.8-2.10), which this replaces."""
import sys

from mindspore.parallel.cluster.process_entity import _api
from mindspore.parallel.cluster.run import main

if not callable(getattr(_api, "_is_local_ip", None)):
    sys.exit("This MindSpore's msrun has no _api._is_local_ip: run the two-node tests on two machines.")
_api._is_local_ip = lambda ip: False  # pylint: disable=protected-access
sys.argv[0] = "msrun"
sys.exit(main())
