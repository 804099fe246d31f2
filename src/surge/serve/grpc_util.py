"""`surge.serve.grpc_util`, as `ray.serve.grpc_util`: what a gRPC method receives."""

from surge.replica.grpc_context import RayServegRPCContext, gRPCInputStream

__all__ = ["RayServegRPCContext", "gRPCInputStream"]
