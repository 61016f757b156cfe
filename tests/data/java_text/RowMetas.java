import java.util.*;

// The order of "rowMetas" in Angel's _meta, step by step as Angel writes it (angel-ps/core,
// com.tencent.angel.model.output.format): MatrixPartitionMeta keeps rowMetas in a LinkedHashMap,
// filled by RowFormat/ColumnFormat.save in the order the rows are written (ascending with the default
// DenseServerRowsStorage); MatrixPartitionMeta.write(JSONObject) copies it into a `new HashMap<>()`
// (default capacity) and jettison's JSONObject keeps that map's iteration order.
// Input: lines "startRow endRow"; output: the rowMetas keys in _meta order, one line per input line.
public class RowMetas {
  public static void main(String[] args) {
    Scanner s = new Scanner(System.in);
    while (s.hasNextInt()) {
      int r0 = s.nextInt(), r1 = s.nextInt();
      Map<Integer, Integer> rowMetas = new LinkedHashMap<>();
      for (int r = r0; r < r1; r++) rowMetas.put(r, r);
      Map<Integer, Integer> rowJsonMap = new HashMap<>();
      for (Map.Entry<Integer, Integer> e : rowMetas.entrySet()) rowJsonMap.put(e.getKey(), e.getValue());
      StringBuilder b = new StringBuilder();
      for (int k : rowJsonMap.keySet()) b.append(k).append(' ');
      System.out.println(b.toString().trim());
    }
  }
}
