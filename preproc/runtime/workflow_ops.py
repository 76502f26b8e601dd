"""The operators of a fitted NVTabular workflow, found by walking its graph: the pipelines read
what Categorify and Normalize fitted (vocabularies, statistics) from these."""


def ops_of(workflow, op_type) -> list:
    """Every operator of `op_type` in the workflow's graph, depth first from its output node
    (each graph node once; an operator shared by two nodes appears twice)."""
    found, seen, stack = [], set(), [workflow.output_node]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node.op, op_type):
            found.append(node.op)
        stack.extend(node.parents_with_dependencies)
    return found
