import sys

from goodput_services.actuator.service import SERVICE
from goodput_services.base import run_service

sys.exit(run_service(SERVICE))
