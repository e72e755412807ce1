import sys

from goodput_services.base import run_service
from goodput_services.replicator.service import SERVICE

sys.exit(run_service(SERVICE))
