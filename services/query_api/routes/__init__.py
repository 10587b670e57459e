"""HTTP routes of the query API, one module per resource."""
