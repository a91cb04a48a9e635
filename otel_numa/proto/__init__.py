"""Generated protobuf and gRPC modules for the kubelet podresources API and the CRI runtime service.

The ``*.proto`` files here are subsets of the published APIs with the same package, service, message
and field names and numbers; ``scripts/gen_protos.sh`` regenerates the ``*_pb2*`` modules and stubs.
"""
