//! Towers and scopes: `TowerContext`, the `VariableStore` with variable scopes, reuse and
//! collections, enforcement of the tower-function rules, and replication of a tower function.
