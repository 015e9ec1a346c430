"""calib.chakra: the one Chakra ET codec (model, read/write, validate, JSON)."""

from calib.chakra.model import ATTR_SLOTS, ET_VERSION, Attr, CommType, ExecutionTrace, IOInfo, Node, NodeType

__all__ = ["ATTR_SLOTS", "ET_VERSION", "Attr", "CommType", "ExecutionTrace", "IOInfo", "Node", "NodeType"]
