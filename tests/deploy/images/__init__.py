"""`just test-images`: build deploy/docker/Dockerfile's two images with podman on a Debian base
made here, run the five services from the service image against a real nats-server (TLS,
operator-mode creds), and one rank from the rank image against them (README: "Container
images").

Needs root, network access to Debian's mirror and PyPI, and a few GB of disk; minutes cold,
about one warm (the base images are cached). Not part of `just test`: it is run by hand, and
must pass before a change to the images is resolved.
"""
