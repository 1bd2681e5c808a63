// Strict dashboard types built on @grafana/schema (pinned to the Grafana version that
// docker-compose.yml runs). `Dashboard` from @grafana/schema types panel `options`,
// `fieldConfig.defaults.custom` and `targets` as open records; these types close them per
// panel plugin (the plugins' own generated option types) and type every target as a Prometheus
// query, so tsc's excess-property checks reject unknown or misspelled keys everywhere.
//
// gen-ts.mjs wraps each dashboards/*.json as an object literal checked against both
// `StrictDashboard` and the plain `Dashboard`.

import type {
  Dashboard,
  DataQuery,
  DashboardLink,
  FieldConfig,
  FieldConfigSource,
  MatcherConfig,
  Panel,
  RowPanel,
  VariableModel,
} from '@grafana/schema';
import type * as BarGauge from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen.js';
import type * as Heatmap from '@grafana/schema/dist/esm/raw/composable/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen.js';
import type * as Stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen.js';
import type * as Table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen.js';
import type * as TimeSeries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen.js';

export type { Dashboard };

/** JSON spelling of a schema type: string enums become the union of their literal values. */
export type Json<T> = T extends string
  ? string extends T
    ? string
    : `${T}`
  : T extends ReadonlyArray<infer U>
    ? Json<U>[]
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;

/** The bundled Prometheus datasource, selected through the `datasource` template variable. */
export type PromDatasourceRef = { type: 'prometheus'; uid: '${datasource}' };

/** A Prometheus target (the fields of the Prometheus dataquery schema that the dashboards use). */
export type PromQuery = Omit<Json<DataQuery>, 'datasource'> & {
  datasource?: PromDatasourceRef;
  expr: string;
  legendFormat?: string;
  instant?: boolean;
  range?: boolean;
  format?: 'time_series' | 'table' | 'heatmap';
  interval?: string;
  intervalFactor?: number;
  exemplar?: boolean;
  editorMode?: 'code' | 'builder';
};

/** A field data link (`FieldConfig.links` is `unknown[]` in the schema). */
export type DataLink = { title: string; url: string; targetBlank?: boolean };

type Override = {
  matcher: Json<MatcherConfig>;
  properties: { id: string; value?: unknown }[];
};

type StrictFieldConfigSource<Custom> = Omit<Json<FieldConfigSource>, 'defaults' | 'overrides'> & {
  defaults: Omit<Json<FieldConfig>, 'custom' | 'links'> & { custom?: Json<Custom>; links?: DataLink[] };
  overrides: Override[];
};

/** The transformations the dashboards use, with their options (open records in the schema). */
type Transformation =
  | {
      id: 'groupingToMatrix';
      options: { columnField: string; rowField: string; valueField: string; emptyValue?: 'null' | 'empty' | 'zero' };
    }
  | {
      id: 'organize';
      options: {
        excludeByName?: Record<string, boolean>;
        includeByName?: Record<string, boolean>;
        indexByName?: Record<string, number>;
        renameByName?: Record<string, string>;
      };
    }
  | { id: 'sortBy'; options: { fields?: Record<string, never>; sort: { field: string; desc?: boolean }[] } };

type PanelOf<Type extends string, Options, Custom> = Omit<
  Json<Panel>,
  'type' | 'options' | 'fieldConfig' | 'targets' | 'datasource' | 'transformations'
> & {
  type: Type;
  datasource: PromDatasourceRef;
  targets: PromQuery[];
  options: Json<Options>;
  fieldConfig: StrictFieldConfigSource<Custom>;
  transformations?: Transformation[];
};

export type StrictRow = Omit<Json<RowPanel>, 'panels'> & { panels: StrictPanel[] };

export type StrictPanel =
  | PanelOf<'timeseries', TimeSeries.Options, TimeSeries.FieldConfig>
  | PanelOf<'heatmap', Heatmap.Options, Heatmap.FieldConfig>
  | PanelOf<'stat', Stat.Options, Record<string, never>>
  | PanelOf<'bargauge', BarGauge.Options, Record<string, never>>
  | PanelOf<'table', Table.Options, Table.FieldConfig>;

type StrictVariable = Omit<Json<VariableModel>, 'datasource'> & {
  datasource?: PromDatasourceRef;
};

export type StrictDashboard = Omit<Json<Dashboard>, 'panels' | 'templating' | 'links'> & {
  uid: string;
  title: string;
  panels: (StrictPanel | StrictRow)[];
  templating: { list: StrictVariable[] };
  links?: Json<DashboardLink>[];
};
