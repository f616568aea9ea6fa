# A training image for real clusters with what the local test images contain (hack/rootfs.sh): Debian's
# torch with torchrun, python-etcd (both of torch's etcd rendezvous backends import it; torch does not depend on
# it), Open MPI and MPICH with mpi4py, and sshd for MPI workers. The tests prove these suites:
#   SUITE=forky   torch 2.14.1 (Python 3.14)   the default, as in `make demo`
#   SUITE=trixie  torch 2.6.0  (Python 3.13)
#   docker build -f build/trainer-pytorch.Dockerfile --build-arg SUITE=forky -t REGISTRY/trainer-pytorch:2.14 .
# Debian's torch runs on CPUs and is built without libuv: jobs on this image set USE_LIBUV=0 (torch >= 2.4 asks
# for a libuv TCPStore otherwise), as examples/local/*.yaml do. For GPUs start from an official image instead,
# which has CUDA and libuv, and add the same extras:
#   FROM pytorch/pytorch:<version>-cuda<cuda>-cudnn9-runtime
#   RUN pip install --no-cache-dir python-etcd==0.4.5 && apt-get update && apt-get install -y --no-install-recommends \
#         openssh-server openssh-client procps && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*
# torch 2.3 to 2.7 close the whole rendezvous when an agent gets SIGTERM; the webhook's leave hook handles that
# (docs/contract.md); the tests prove torch 2.6 and 2.14.
ARG SUITE=forky
FROM debian:${SUITE}-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3-torch python3-etcd python3-mpi4py openmpi-bin mpich openssh-server openssh-client procps \
    && rm -rf /var/lib/apt/lists/* \
    # Every pod makes its own host keys: an image must not carry one key for all of them.
    && rm -f /etc/ssh/ssh_host_*
# Mounted read-only by the webhook: the hostfile, discover_hosts.sh and the sidecar binary.
ENV PATH=/etc/elastic-training:$PATH
WORKDIR /workspace
