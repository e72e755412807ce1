import sys

from goodput_services.base import run_service
from goodput_services.hostmon.service import SERVICE

sys.exit(run_service(SERVICE))
