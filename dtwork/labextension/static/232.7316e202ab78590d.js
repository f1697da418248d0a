"use strict";(self.rspackChunkdtwork=self.rspackChunkdtwork||[]).push([[232],{277(r,o,t){var e=t(415),a=t.n(e),n=t(688),i=(t.n(n))()(a());i.push([r.id,`/* dtwork sidebar: only JupyterLab CSS variables, so light, dark and high-contrast themes apply. */

.dtwork-Panel {
  overflow-y: auto;
  padding: 8px 10px;
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color1);
  font-family: var(--jp-ui-font-family);
  font-size: var(--jp-ui-font-size1);
  min-width: 240px;
}

.dtwork-Header {
  display: flex;
  flex-wrap: wrap;
  align-items: center;
  justify-content: space-between;
  gap: 4px 8px;
  margin-bottom: 6px;
}

.dtwork-Header h2 {
  margin: 0;
  font-size: var(--jp-ui-font-size2);
  font-weight: 600;
}

.dtwork-Section {
  border-top: var(--jp-border-width) solid var(--jp-border-color2);
  padding: 6px 0;
}

.dtwork-Section-title {
  margin: 2px 0 6px;
  font-size: var(--jp-ui-font-size1);
  font-weight: 600;
  text-transform: uppercase;
  letter-spacing: 0.04em;
  color: var(--jp-ui-font-color2);
}

.dtwork-mod-unavailable .dtwork-Section {
  display: none;
}

.dtwork-Empty {
  margin: 4px 0;
  color: var(--jp-ui-font-color2);
  line-height: 1.4;
}

.dtwork-Problem {
  margin: 6px 0;
  padding: 6px 8px;
  border-left: 3px solid var(--jp-warn-color1);
  background: var(--jp-layout-color2);
  color: var(--jp-ui-font-color1);
}

.dtwork-Problem.dtwork-mod-error {
  border-left-color: var(--jp-error-color1);
}

.dtwork-Problem p {
  margin: 4px 0 0;
}

.dtwork-List {
  display: flex;
  flex-direction: column;
  gap: 6px;
}

.dtwork-Card {
  padding: 6px 8px;
  border: var(--jp-border-width) solid var(--jp-border-color2);
  border-radius: var(--jp-border-radius);
  background: var(--jp-layout-color0);
}

/* a search: its header, then its trial runs' cards, indented under a rule */
.dtwork-Search {
  display: flex;
  flex-direction: column;
  gap: 4px;
  padding-left: 6px;
  border-left: 3px solid var(--jp-brand-color2);
}

.dtwork-Card-head {
  display: flex;
  flex-wrap: wrap;
  align-items: center;
  gap: 4px 6px;
}

.dtwork-Card-title {
  flex: 1 1 auto;
  min-width: 3em;
  font-weight: 600;
  overflow-wrap: anywhere;
}

.dtwork-Meta {
  margin-top: 2px;
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0);
  overflow-wrap: anywhere;
}

.dtwork-Id {
  font-family: var(--jp-code-font-family);
}

.dtwork-Badge {
  padding: 0 6px;
  border-radius: 8px;
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-inverse-font-color1);
  background: var(--jp-layout-color4);
}

.dtwork-Badge.dtwork-mod-running,
.dtwork-Badge.dtwork-mod-starting {
  background: var(--jp-brand-color1);
}

.dtwork-Badge.dtwork-mod-completed {
  background: var(--jp-success-color1);
}

.dtwork-Badge.dtwork-mod-failed {
  background: var(--jp-error-color1);
}

.dtwork-Badge.dtwork-mod-interrupted,
.dtwork-Badge.dtwork-mod-stopped {
  background: var(--jp-warn-color1);
}

/* a cluster started by a script, not a notebook: marked, and its Stop quieter than a notebook's */
.dtwork-Tag {
  padding: 0 6px;
  border: 1px solid var(--jp-border-color1);
  border-radius: 8px;
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
}

.dtwork-Cluster.dtwork-mod-script {
  border-style: dashed;
}

.dtwork-StopButton.dtwork-mod-script {
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color2);
}

.dtwork-Ranks {
  width: 100%;
  margin-top: 4px;
  border-collapse: collapse;
  font-size: var(--jp-ui-font-size0);
}

.dtwork-Ranks th,
.dtwork-Ranks td {
  padding: 1px 4px;
  text-align: left;
  border-bottom: var(--jp-border-width) solid var(--jp-border-color3);
}

.dtwork-Ranks th {
  color: var(--jp-ui-font-color2);
  font-weight: normal;
}

.dtwork-Diverged {
  margin-top: 4px;
  color: var(--jp-error-color1);
  font-size: var(--jp-ui-font-size0);
}

.dtwork-Adaptive {
  margin-top: 4px;
  color: var(--jp-ui-font-color1);
  font-size: var(--jp-ui-font-size0);
  overflow-wrap: anywhere;
}

.dtwork-Adaptive-lr {
  color: var(--jp-ui-font-color2);
}

.dtwork-Stats {
  display: grid;
  grid-template-columns: repeat(auto-fill, minmax(90px, 1fr));
  gap: 2px 8px;
  margin: 4px 0;
}

.dtwork-Stat {
  display: flex;
  flex-direction: column;
}

.dtwork-Stat-label {
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0);
}

.dtwork-Stat-value {
  font-family: var(--jp-code-font-family);
  /* "8.3k samples/s" on one line: a narrow sidebar clips it rather than wrapping */
  white-space: nowrap;
  overflow: hidden;
  text-overflow: ellipsis;
}

.dtwork-Sparkline polyline {
  stroke: var(--jp-brand-color1);
  stroke-width: 1.5;
}

.dtwork-Sparkline.dtwork-mod-empty {
  color: var(--jp-ui-font-color3);
  font-size: var(--jp-ui-font-size0);
}

.dtwork-ReportLink {
  margin-left: auto;
  color: var(--jp-content-link-color);
  text-decoration: none;
}

.dtwork-ReportLink:hover {
  text-decoration: underline;
}

.dtwork-StopButton {
  margin-left: auto;
}

.dtwork-StopButton,
.dtwork-InsertButton {
  flex: none;
  height: 22px;
  padding: 0 8px;
  white-space: nowrap;
  font-size: var(--jp-ui-font-size0);
}

.dtwork-Bar {
  height: 4px;
  margin: 4px 0;
  background: var(--jp-layout-color3);
  border-radius: 2px;
  overflow: hidden;
}

.dtwork-Bar-fill {
  height: 100%;
  background: var(--jp-brand-color1);
}

.dtwork-Version {
  color: var(--jp-ui-font-color3);
  font-size: var(--jp-ui-font-size0);
}

/* a training cell's figure read from the run store (a notebook reopened mid-training) */
.dtwork-CellView-header {
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size1);
  padding: 2px 0 4px;
}
`,""]),t.d(o,{},{A:i})},688(r){r.exports=function(r){var o=[];return o.toString=function(){return this.map(function(o){var t="",e=void 0!==o[5];return o[4]&&(t+="@supports (".concat(o[4],") {")),o[2]&&(t+="@media ".concat(o[2]," {")),e&&(t+="@layer".concat(o[5].length>0?" ".concat(o[5]):""," {")),t+=r(o),e&&(t+="}"),o[2]&&(t+="}"),o[4]&&(t+="}"),t}).join("")},o.i=function(r,t,e,a,n){"string"==typeof r&&(r=[[null,r,void 0]]);var i={};if(e)for(var d=0;d<this.length;d++){var p=this[d][0];null!=p&&(i[p]=!0)}for(var l=0;l<r.length;l++){var c=[].concat(r[l]);e&&i[c[0]]||(void 0!==n&&(void 0===c[5]||(c[1]="@layer".concat(c[5].length>0?" ".concat(c[5]):""," {").concat(c[1],"}")),c[5]=n),t&&(c[2]&&(c[1]="@media ".concat(c[2]," {").concat(c[1],"}")),c[2]=t),a&&(c[4]?(c[1]="@supports (".concat(c[4],") {").concat(c[1],"}"),c[4]=a):c[4]="".concat(a)),o.push(c))}},o}},415(r){r.exports=function(r){return r[1]}},886(r){var o=[];function t(r){for(var t=-1,e=0;e<o.length;e++)if(o[e].identifier===r){t=e;break}return t}function e(r,e){for(var a={},n=[],i=0;i<r.length;i++){var d=r[i],p=e.base?d[0]+e.base:d[0],l=a[p]||0,c="".concat(p," ").concat(l);a[p]=l+1;var s=t(c),u={css:d[1],media:d[2],sourceMap:d[3],supports:d[4],layer:d[5]};if(-1!==s)o[s].references++,o[s].updater(u);else{var f=function(r,o){var t=o.domAPI(o);return t.update(r),function(o){o?(o.css!==r.css||o.media!==r.media||o.sourceMap!==r.sourceMap||o.supports!==r.supports||o.layer!==r.layer)&&t.update(r=o):t.remove()}}(u,e);e.byIndex=i,o.splice(i,0,{identifier:c,updater:f,references:1})}n.push(c)}return n}r.exports=function(r,a){var n=e(r=r||[],a=a||{});return function(r){r=r||[];for(var i=0;i<n.length;i++){var d=t(n[i]);o[d].references--}for(var p=e(r,a),l=0;l<n.length;l++){var c=t(n[l]);0===o[c].references&&(o[c].updater(),o.splice(c,1))}n=p}}},285(r){var o={};r.exports=function(r,t){var e=function(r){if(void 0===o[r]){var t=document.querySelector(r);if(window.HTMLIFrameElement&&t instanceof window.HTMLIFrameElement)try{t=t.contentDocument.head}catch(r){t=null}o[r]=t}return o[r]}(r);if(!e)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");e.appendChild(t)}},298(r){r.exports=function(r){var o=document.createElement("style");return r.setAttributes(o,r.attributes),r.insert(o,r.options),o}},206(r,o,t){r.exports=function(r){var o=t.nc;o&&r.setAttribute("nonce",o)}},167(r){r.exports=function(r){if("u"<typeof document)return{update:function(){},remove:function(){}};var o=r.insertStyleElement(r);return{update:function(t){var e,a,n;e="",t.supports&&(e+="@supports (".concat(t.supports,") {")),t.media&&(e+="@media ".concat(t.media," {")),(a=void 0!==t.layer)&&(e+="@layer".concat(t.layer.length>0?" ".concat(t.layer):""," {")),e+=t.css,a&&(e+="}"),t.media&&(e+="}"),t.supports&&(e+="}"),(n=t.sourceMap)&&"u">typeof btoa&&(e+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(n))))," */")),r.styleTagTransform(e,o,r.options)},remove:function(){var r;null===(r=o).parentNode||r.parentNode.removeChild(r)}}}},343(r){r.exports=function(r,o){if(o.styleSheet)o.styleSheet.cssText=r;else{for(;o.firstChild;)o.removeChild(o.firstChild);o.appendChild(document.createTextNode(r))}}},579(r,o,t){var e=t(886),a=t.n(e),n=t(167),i=t.n(n),d=t(285),p=t.n(d),l=t(206),c=t.n(l),s=t(298),u=t.n(s),f=t(343),v=t.n(f),w=t(277),k={};k.styleTagTransform=v(),k.setAttributes=c(),k.insert=p().bind(null,"head"),k.domAPI=i(),k.insertStyleElement=u(),a()(w.A,k),w.A&&w.A.locals&&w.A.locals}}]);