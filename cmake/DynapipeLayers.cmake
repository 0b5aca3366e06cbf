# The one place the module dependency direction is written down.
# DYNAPIPE_LAYER_<module> lists the modules <module> may depend on (directly).
# dynapipe_add_module() checks its DEPS against this table at configure time and
# tests/layering_test.sh checks every #include line against it.
set(DYNAPIPE_MODULES core data cost partition batching schedule plan planner report runtime cli)

set(DYNAPIPE_LAYER_core)
set(DYNAPIPE_LAYER_data     core)
set(DYNAPIPE_LAYER_cost     core)
set(DYNAPIPE_LAYER_partition core)
set(DYNAPIPE_LAYER_batching core cost)
set(DYNAPIPE_LAYER_schedule core cost)
set(DYNAPIPE_LAYER_plan     core cost schedule)
set(DYNAPIPE_LAYER_planner  core data cost batching schedule plan)
set(DYNAPIPE_LAYER_report   core cost schedule plan)
set(DYNAPIPE_LAYER_runtime  core data cost batching schedule plan planner)
set(DYNAPIPE_LAYER_cli      core data cost partition batching schedule plan planner report runtime)
